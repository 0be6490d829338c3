"""The shared vocabulary of the compiler, the engine and the runtime: the layer-graph IR, plan
types and strategy names, and the batch arithmetic. Plain data; imports nothing else of the
package (tests/test_layering.py)."""
