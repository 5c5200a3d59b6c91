"""Ebbflow operator: resizes ElasticTrainingJob workers as GPU capacity changes."""
