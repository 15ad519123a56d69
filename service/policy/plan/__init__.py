"""The staged plan: its stages, their order, the decision type, and the calibration's questions."""
