"""Closed forms: optimal losses, fixed points, population losses."""

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
