"""Model definitions, free of any parallelism code. Each family exposes a `ModelSpec`;
titanlite/families.py pairs it with the family's parallelize function."""

from models.spec import ModelArgs, ModelSpec, TrainableModel

__all__ = ["ModelArgs", "ModelSpec", "TrainableModel"]
