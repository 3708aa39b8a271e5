"""masd: the email side of the MAS mode contract v0.1."""

__version__ = "0.1.0"
