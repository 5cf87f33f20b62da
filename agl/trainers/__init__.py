"""Trainers: one package per algorithm. Each consumes ``Trajectory`` values and publishes new resources.

Nothing heavy is imported here; ``agl.trainers.rl`` and ``agl.trainers.sft`` load torch only when training runs,
and ``agl.trainers.apo`` never does.
"""
