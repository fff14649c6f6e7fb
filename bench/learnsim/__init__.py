"""The learning simulator's parts (`bench/learning_sim.py` runs them)."""
