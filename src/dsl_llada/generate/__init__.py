"""Text in, text out: prompts through a sampler, and the `dsl-llada generate` job."""
