"""The package's version and the API version it speaks. The package's major
version follows the API's (v1 -> 1.x.y)."""

__version__ = "1.0.0"
API_VERSION = "v1"
