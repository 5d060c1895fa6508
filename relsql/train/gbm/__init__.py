"""Propositional models on one-hop SQL features: the features, LightGBM trees as plain data, the
baselines a relational model has to beat, and the hybrid blend of the network with a GBM."""
