"""Serving: an OpenAI-compatible HTTP server with continuous batching and streamed denoising, and a Gradio web UI.

Needs the optional extra `pip install "dsl-llada[serve]"` (fastapi, uvicorn, gradio).
"""
