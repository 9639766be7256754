"""Dependencies as ``Annotated`` aliases, so route signatures read like sentences."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from zerotune.api.guard import UNAUTHORIZED
from zerotune.api.schemas import MAX_ID
from zerotune.api.service import Service
from zerotune.api.settings import Settings
from zerotune.db.session import session_scope


async def get_service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_settings(service: ServiceDep) -> Settings:
    return service.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_db(service: ServiceDep) -> Iterator[Session]:
    with session_scope(service.sessions) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_db)]

Id = Annotated[int, Path(ge=1, le=MAX_ID, description="a row id")]

_bearer = HTTPBearer(auto_error=False, description="Needed for writes when the service has ZEROTUNE_TOKEN set.")


async def require_token(settings: SettingsDep,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Writes need ``Authorization: Bearer <ZEROTUNE_TOKEN>`` when a token is configured; reads never do."""
    if settings.token is None:
        return
    expected = settings.token.get_secret_value().encode()
    given = credentials.credentials.encode() if credentials is not None else b""
    if not hmac.compare_digest(given, expected):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            detail=UNAUTHORIZED,
                            headers={"WWW-Authenticate": "Bearer"})


WriteAccess = Depends(require_token)
