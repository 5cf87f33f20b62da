"""Trainers: one package per algorithm. Each consumes ``Trajectory`` values and publishes new resources.

Nothing heavy is imported here; ``agl.trainers.rl`` loads torch only when a trainer or update is used.
"""
