"""Trust: what a statement about a cube rests on, and what must hold before it is accepted.

- :mod:`._evidence`: the basis of every statement (proved now / signed by a trusted key /
  claimed) and the decisions that read it.
"""
