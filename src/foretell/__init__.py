"""foretell: lossless speculative decoding."""

from foretell.api import Pipeline, load
from foretell.config import HeadTreeShape, HiddenStateOptions, SpeculativeConfig, TreeShape
from foretell.engine import Engine
from foretell.errors import ForetellError
from foretell.types import Chunk, GenerationResult, GenerationStats, SamplingParams

__all__ = ["load", "SpeculativeConfig", "TreeShape", "HeadTreeShape", "HiddenStateOptions", "Pipeline", "Engine",
           "Chunk", "GenerationResult", "GenerationStats", "SamplingParams", "ForetellError"]
__version__ = "0.1.0"
