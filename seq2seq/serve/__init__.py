"""Serve a trained model over HTTP, with a page to explore it in a browser.

    python -m seq2seq.serve best.ckpt                  # the checkpoint, our own search
    python -m seq2seq.serve --model model-ct2          # a seq2seq.export (CTranslate2)
    python -m seq2seq.serve best.ckpt --port 8000 --token SECRET

Endpoints: GET /health, GET /info, POST /translate, POST /attention (checkpoint only), GET /
(the page) and FastAPI's /docs. One worker thread owns the model and decodes the sentences of
concurrent requests together (seq2seq.serve.batcher); every answer equals what
`python -m seq2seq.translate` prints for the same input and settings.

FastAPI and uvicorn are optional: `pip install -e ".[serve]"`. Only this package imports them,
and it never imports Lightning or Hydra (tests/test_architecture.py).
"""
