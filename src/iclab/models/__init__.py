"""Learners that are ``nn.Module``s."""

from iclab.models.bilinear import BilinearFFN as BilinearFFN
from iclab.models.bilinear import BilinearTransformer as BilinearTransformer
from iclab.models.bilinear import BilinearTransformerConfig as BilinearTransformerConfig
from iclab.models.bilinear import embed_scratch as embed_scratch
from iclab.models.categorical_attention import CategoricalTransformer as CategoricalTransformer
from iclab.models.categorical_attention import CategoricalTransformerConfig as CategoricalTransformerConfig
from iclab.models.categorical_attention import SingleStepCategorical as SingleStepCategorical
from iclab.models.kernel_attention import KernelAttention as KernelAttention
from iclab.models.kernel_attention import KernelTransformer as KernelTransformer
from iclab.models.kernel_attention import KernelTransformerConfig as KernelTransformerConfig
from iclab.models.language import LanguageGD as LanguageGD
from iclab.models.language import LanguageGPT as LanguageGPT
from iclab.models.linear_attention import LinearAttention as LinearAttention
from iclab.models.linear_attention import LinearTransformer as LinearTransformer
from iclab.models.linear_attention import LinearTransformerConfig as LinearTransformerConfig
from iclab.models.linear_attention import embed as embed
from iclab.models.reduced_attention import CubicFeatureMLP as CubicFeatureMLP
from iclab.models.reduced_attention import MergedAttention as MergedAttention
from iclab.models.reduced_attention import SeparateAttention as SeparateAttention

__all__ = [
    "BilinearFFN",
    "BilinearTransformer",
    "BilinearTransformerConfig",
    "CategoricalTransformer",
    "CategoricalTransformerConfig",
    "CubicFeatureMLP",
    "KernelAttention",
    "KernelTransformer",
    "KernelTransformerConfig",
    "LanguageGD",
    "LanguageGPT",
    "LinearAttention",
    "LinearTransformer",
    "LinearTransformerConfig",
    "MergedAttention",
    "SeparateAttention",
    "SingleStepCategorical",
    "embed",
    "embed_scratch",
]
