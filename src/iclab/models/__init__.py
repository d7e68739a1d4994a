"""Learners that are ``nn.Module``s."""

from iclab.models.linear_attention import LinearAttention as LinearAttention
from iclab.models.linear_attention import LinearTransformer as LinearTransformer
from iclab.models.linear_attention import LinearTransformerConfig as LinearTransformerConfig
from iclab.models.linear_attention import embed as embed
