"""Prediction: causal links (the NAc), rhythms (the SCN), oscillators and statistical patterns (the Angular Gyrus)."""
