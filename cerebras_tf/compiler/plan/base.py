"""The planner interface. The types a planner returns live in `cerebras_tf.core.plans`."""

import abc

from cerebras_tf.core.plans import Plan, PlanOptions


class Planner(abc.ABC):
  """Maps a LayerGraph onto an engine for one execution strategy.

  Implementations are pure functions of their inputs (no TensorFlow, no global state), so the
  same (graph, engine, options) always gives the same Plan.
  """

  strategy: str = ""

  @abc.abstractmethod
  def plan(self, graph, engine, options: PlanOptions) -> Plan:
    """Returns the Plan; a model that does not fit gives `fits=False` and a reason, not a raise.

    Args:
      graph: `cerebras_tf.core.ir.LayerGraph`.
      engine: `cerebras_tf.engine.spec.EngineSpec`.
      options: what the user asked for (batch size, strategy, systems...).
    """
