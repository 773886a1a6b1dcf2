"""Input data: files read as rows, the file cache, splits and folds, ranking pairs, demo
comments, tokens and the batches each step takes (framework-free).
"""
