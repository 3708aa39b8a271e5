"""What an operator checks and asks: ``masd doctor`` and ``masd explain``."""
