"""The presets a request may name."""

from __future__ import annotations

from fastapi import APIRouter

from zerotune.api.deps import SettingsDep
from zerotune.api.schemas import CatalogPublic
from zerotune.costmodel.catalog import catalog

router = APIRouter(prefix="/v1/catalog", tags=["catalog"])


@router.get("", response_model=CatalogPublic)
async def read_catalog(settings: SettingsDep) -> CatalogPublic:
    """Model and cluster presets (``NAME:N`` sets the number of nodes), strategy presets, executors."""
    return CatalogPublic(**catalog(), executors=list(settings.executors))
