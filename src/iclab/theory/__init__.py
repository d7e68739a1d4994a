"""Closed forms: optimal losses, fixed points, population losses.

The functions of Ahn et al. 2023 (:mod:`iclab.theory.preconditioned_gd`) and Cheng et al. 2024
(:mod:`iclab.theory.functional_gd`) are re-exported here; the population dynamics of Zhang et al. 2025
(:mod:`iclab.theory.attention_dynamics`: plateau losses of eq. (19), fixed points, the value ODE (21)), the
polynomial features of Sun et al. 2025 and the Wishart moments are public as modules.
"""

from iclab.theory import attention_dynamics as attention_dynamics
from iclab.theory import polynomial_features as polynomial_features
from iclab.theory import wishart as wishart
from iclab.theory.categorical import language_parameter_counts as language_parameter_counts
from iclab.theory.functional_gd import bayes_risk as bayes_risk
from iclab.theory.functional_gd import conditional_icl_loss as conditional_icl_loss
from iclab.theory.functional_gd import convergence_factor as convergence_factor
from iclab.theory.functional_gd import episode_bayes_gap as episode_bayes_gap
from iclab.theory.functional_gd import fgd_bayes_gap as fgd_bayes_gap
from iclab.theory.functional_gd import fgd_icl_loss as fgd_icl_loss
from iclab.theory.functional_gd import fgd_propagator as fgd_propagator
from iclab.theory.functional_gd import label_propagator as label_propagator
from iclab.theory.functional_gd import linear_gp_bayes_risk as linear_gp_bayes_risk
from iclab.theory.functional_gd import max_stable_step as max_stable_step
from iclab.theory.functional_gd import stationary_distance as stationary_distance
from iclab.theory.functional_gd import stationary_point as stationary_point
from iclab.theory.functional_gd import stationary_point_learner as stationary_point_learner
from iclab.theory.preconditioned_gd import best_constant_step as best_constant_step
from iclab.theory.preconditioned_gd import episode_loss as episode_loss
from iclab.theory.preconditioned_gd import gradient_structure as gradient_structure
from iclab.theory.preconditioned_gd import loss_gradients as loss_gradients
from iclab.theory.preconditioned_gd import mc_loss as mc_loss
from iclab.theory.preconditioned_gd import one_layer_loss as one_layer_loss
from iclab.theory.preconditioned_gd import one_layer_loss_tensor as one_layer_loss_tensor
from iclab.theory.preconditioned_gd import one_step_scalar_loss as one_step_scalar_loss
from iclab.theory.preconditioned_gd import pattern11_model as pattern11_model
from iclab.theory.preconditioned_gd import pattern11_scalar_loss as pattern11_scalar_loss
from iclab.theory.preconditioned_gd import relu_one_layer_loss as relu_one_layer_loss
from iclab.theory.preconditioned_gd import sparse_scalar_loss as sparse_scalar_loss
from iclab.theory.preconditioned_gd import theorem1_isotropic_loss as theorem1_isotropic_loss
from iclab.theory.preconditioned_gd import theorem1_isotropic_scale as theorem1_isotropic_scale
from iclab.theory.preconditioned_gd import theorem1_loss as theorem1_loss
from iclab.theory.preconditioned_gd import theorem1_preconditioner as theorem1_preconditioner
from iclab.theory.preconditioned_gd import theorem3_optimum as theorem3_optimum
from iclab.theory.preconditioned_gd import theorem4_optimum as theorem4_optimum
from iclab.theory.preconditioned_gd import theorem5_loss as theorem5_loss
from iclab.theory.preconditioned_gd import theorem5_scale as theorem5_scale
from iclab.theory.preconditioned_gd import trace_moments as trace_moments
from iclab.theory.preconditioned_gd import wishart_eigenvalues as wishart_eigenvalues
from iclab.theory.preconditioned_gd import wishart_trace_moments as wishart_trace_moments

__all__ = [
    "attention_dynamics",
    "bayes_risk",
    "best_constant_step",
    "conditional_icl_loss",
    "convergence_factor",
    "episode_bayes_gap",
    "episode_loss",
    "fgd_bayes_gap",
    "fgd_icl_loss",
    "fgd_propagator",
    "gradient_structure",
    "label_propagator",
    "language_parameter_counts",
    "linear_gp_bayes_risk",
    "loss_gradients",
    "max_stable_step",
    "mc_loss",
    "one_layer_loss",
    "one_layer_loss_tensor",
    "one_step_scalar_loss",
    "pattern11_model",
    "pattern11_scalar_loss",
    "polynomial_features",
    "relu_one_layer_loss",
    "sparse_scalar_loss",
    "stationary_distance",
    "stationary_point",
    "stationary_point_learner",
    "theorem1_isotropic_loss",
    "theorem1_isotropic_scale",
    "theorem1_loss",
    "theorem1_preconditioner",
    "theorem3_optimum",
    "theorem4_optimum",
    "theorem5_loss",
    "theorem5_scale",
    "trace_moments",
    "wishart",
    "wishart_eigenvalues",
    "wishart_trace_moments",
]
