"""Base models: builtin tiny architectures, any Hugging Face causal LM, the builtin tokenizer, image-text models and
their processors, the ``model`` section's checks, and under-trained token detection. Never trains (pretraining the
builtin base goes through the training loop: :mod:`harness.runs.planning.pretrain`)."""
