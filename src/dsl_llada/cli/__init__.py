"""The `dsl-llada` command line: every command's parser and the `main` entry."""
