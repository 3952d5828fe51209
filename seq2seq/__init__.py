"""seq2seq: an encoder-decoder Transformer to train, reproduce, inspect and build on."""

__version__ = "0.1.0"
