"""gmeta-tf: meta-learning recommendation models at scale on TensorFlow 2 + Horovod."""

import os

# Horovod 0.28.1 breaks on Keras 3 variables: the project runs on tf-keras (Keras 2).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
