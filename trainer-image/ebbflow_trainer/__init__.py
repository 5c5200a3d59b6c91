"""Ebbflow trainer: elastic, virtual-node PyTorch training inside worker pods."""
