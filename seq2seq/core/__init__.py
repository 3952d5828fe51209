"""The core: the Transformer and its search in plain PyTorch (no Lightning, Hydra or datasets).

attention.py (multi-head self- and cross-attention), kv_cache.py (the decoder's key/value
cache), model.py (the encoder-decoder), decoding.py (greedy, beam search, sampling). Read in
that order; tests/test_architecture.py checks that nothing here imports more than torch.
"""
