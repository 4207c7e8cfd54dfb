"""Trainer loop, recipes, losses, devices and checkpoints."""
