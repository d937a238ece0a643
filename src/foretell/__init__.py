"""foretell: lossless speculative decoding."""

from foretell.api import Pipeline, load
from foretell.config import HeadTreeShape, HiddenStateOptions, SpeculativeConfig, TreeShape
from foretell.engine import Chunk, Engine, GenerationResult
from foretell.errors import ForetellError
from foretell.types import GenerationStats, SamplingParams

__all__ = ["load", "SpeculativeConfig", "TreeShape", "HeadTreeShape", "HiddenStateOptions", "Pipeline", "Engine",
           "Chunk", "GenerationResult", "GenerationStats", "SamplingParams", "ForetellError"]
__version__ = "0.1.0"
