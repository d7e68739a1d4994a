"""Figures and the reproduction report."""
