"""One module per resource, each with one ``APIRouter``."""
