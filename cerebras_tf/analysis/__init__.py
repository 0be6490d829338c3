"""Analyses above the compiler and the engine: analytic graphs of known model shapes, weight
streaming's scaling over systems. No TensorFlow."""
