"""extender: cache-warmth-aware scheduling and predictive pre-scaling for AI inference on Kubernetes."""

#: The release; the distribution (``warmth-extender``) takes its version from here.
__version__ = "0.1.0"
