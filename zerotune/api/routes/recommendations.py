"""POST a model and a cluster, get a recommended config (or a job that will produce it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from zerotune.api import queries
from zerotune.api.deps import Id, ServiceDep, SessionDep, WriteAccess
from zerotune.api.inputs import RecommendationCreate
from zerotune.api.prologue.outputs import ENV_FILES, TOOL_FILES
from zerotune.api.schemas import JobPublic, Message, RecommendationPublic
from zerotune.api.settings import MAX_WAIT_S, Settings
from zerotune.db import repository as repo
from zerotune.errors import NotFoundError

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])

WAIT = (f"hold the request up to this many seconds for the answer, and at most the service's ZEROTUNE_WAIT_MAX_S "
        f"({Settings.model_fields['wait_max_s'].default:g} s unless set; a longer wait is held that long)")


@router.post(
    "", status_code=200, response_model=RecommendationPublic, dependencies=[WriteAccess],
    responses={
        200: {"description": "An equivalent request was answered before (or the job finished within ?wait)."},
        202: {"model": JobPublic, "description": "A job will answer: poll the Location (its state says queued, "
              "running, or why it failed or was cancelled).",
              "headers": {"Location": {"description": "/v1/jobs/{id}", "schema": {"type": "string"}}}},
        401: {"model": Message, "description": "ZEROTUNE_TOKEN is set and the bearer token is missing or wrong."}})
async def create_recommendation(
    body: RecommendationCreate, service: ServiceDep, request: Request,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description=WAIT)]
    = 0,
) -> Response:
    """Recommend a partition strategy for a model on a cluster.

    The request is normalized (presets expanded, defaults filled) and hashed. A stored answer
    comes back at once (200); otherwise the request joins the one job of its equivalence class
    (202, ``Location: /v1/jobs/{id}``), however many identical requests arrive at once.
    """
    tune = await service.normalize(body)
    outcome = await service.answer(tune, wait)
    request.state.request_key = tune.key()  # a valid body: the fast path may answer it next time
    if outcome.answer is not None:
        return Response(outcome.answer, media_type="application/json")
    assert outcome.job is not None
    return Response(outcome.job.model_dump_json(), status_code=202, media_type="application/json",
                    headers={"Location": f"/v1/jobs/{outcome.job.id}"})


@router.get(
    "/{recommendation_id}", response_model=None,
    responses={200: {"model": RecommendationPublic | dict[str, Any],
                     "description": "The recommendation, or with ?format= one export as a file.",
                     "content": {"application/toml": {"schema": {"type": "string"}},
                                 "application/yaml": {"schema": {"type": "string"}}}},
               404: {"model": Message}})
def read_recommendation(
    recommendation_id: Id, session: SessionDep,
    format: Annotated[Literal["zerotune", "deepspeed", "fsdp", "torchtitan", "accelerate", "hf-trainer"] | None,
                      Query(description="download one export: zerotune trainer JSON, DeepSpeed config, FSDP2, "
                                        "torchtitan TOML, accelerate launch YAML, the HF Trainer's DeepSpeed config "
                                        "(\"auto\" where TrainingArguments set it)")] = None,
    plugin: Annotated[Literal["fsdp", "deepspeed"],
                      Query(description="with format=accelerate: the FSDP2 plugin's YAML or the DeepSpeed plugin's "
                                        "(reading the DeepSpeed export as ds_config.json)")] = "fsdp",
) -> Any:
    """A stored recommendation, or one of its exports."""
    row = repo.get_recommendation(session=session, recommendation_id=recommendation_id)
    if row is None:
        raise NotFoundError("recommendation", recommendation_id)
    if format is None:
        return queries.recommendation_public(row)
    if format in ENV_FILES:
        return JSONResponse(row.exports.get(format) or {}, headers={
            "Content-Disposition": f'attachment; filename="{ENV_FILES[format]}"'})
    export = row.exports.get(format) or _rebuilt(row.exports, format)
    if format == "hf-trainer":
        return JSONResponse(export["config"], headers={
            "Content-Disposition": f'attachment; filename="{TOOL_FILES[format]}"'})
    if format == "torchtitan":
        text, name, media = export["toml"], TOOL_FILES["torchtitan"], "application/toml"
    else:
        text, name = (export["fsdp_yaml"], TOOL_FILES["accelerate"]) if plugin == "fsdp" else (
            export["deepspeed_yaml"], TOOL_FILES["accelerate-deepspeed"])
        media = "application/yaml"
    return PlainTextResponse(text, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _rebuilt(exports: dict[str, Any], format: str) -> dict[str, Any]:
    """An export an answer stored before its format existed, built from the answer's own model, cluster, strategy
    and batch (its zerotune export)."""
    from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
    from zerotune.tuner.exports import all_exports

    zt = exports.get("zerotune") or {}
    if not all(k in zt for k in ("model", "cluster", "strategy")):
        raise NotFoundError("export", format)
    built = all_exports(ModelSpec.from_dict(zt["model"]), ClusterSpec.from_dict(zt["cluster"]),
                        Strategy.from_dict(zt["strategy"]), zt.get("global_batch"))
    return dict(built[format])
