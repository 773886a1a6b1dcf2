"""A run: the loop both sides share, its run directory, trackers, timing and the folds loop
(framework-free).
"""
