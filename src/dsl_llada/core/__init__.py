"""The model core: backbones, the converter, `DSLModel`, checkpoints, quantization and the one loader."""
