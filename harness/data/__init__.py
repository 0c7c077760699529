"""Data as tensors: chat encoding with completion-only labels (text and images), the fixed eval items, the stage
mixture stream, batching and collation, and special-token text found in data. Knows configs, not models."""
