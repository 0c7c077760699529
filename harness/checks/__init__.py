"""Checks a researcher runs before trusting a pipeline: ``harness sanity`` (overfit, inputs and images matter),
``harness inspect`` (the white-box view), and what ``harness validate`` prints about the eval pools."""
