"""`laps engine --backend emulated`: the flags of `laps engine` -> an emulated engine server."""
from __future__ import annotations

import argparse
import logging

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.engine import EmulatedEngine, EmulatedKVCodec
from laps_agent.emulated.prefill_cost import calibrate
from laps_agent.emulated.prefix_cache import PrefixCacheModel
from laps_agent.emulated.profile import load_profile
from laps_agent.engine.core.config import EngineConfig
from laps_agent.engine.flags import bucket_grid, decode_order, scheduler_config
from laps_agent.engine.http.serve import check_server_flags, server_settings
from laps_agent.engine.http.server import EngineServer
from laps_agent.engine.metrics import EngineMetrics
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import TokenizerError, load_tokenizer, tokenizer_problem

log = logging.getLogger("laps.engine")


def build_emulated(args: argparse.Namespace) -> tuple[EngineServer, EmulatedEngine]:
    profile = load_profile(args.profile)  # ProfileError is a ValueError: `laps engine` reports it
    check_server_flags(args)
    grid = bucket_grid(args)
    sched = scheduler_config(args, grid, args.max_prefill_tokens or profile.engine.max_prefill_tokens)
    path = args.model or str(default_model_path())
    try:
        tokenizer = load_tokenizer(path)
    except TokenizerError as exc:
        raise ValueError(tokenizer_problem(path, exc)) from None
    context = min(profile.engine.context_length, args.context_length or profile.engine.context_length)
    max_running = args.max_running_requests or profile.engine.max_running_requests
    config = EngineConfig(role=args.role, scheduler=sched, batch_prefill_graphs=grid is not None,
                          batch_prefill_graphs_mode=args.batch_prefill_graphs_mode, max_running_requests=max_running,
                          context_len=context, decode_order=decode_order(args))
    name = args.served_model_name or profile.model.name
    metrics = EngineMetrics(args.role, name, args.labels_file, args.bootstrap_timeout)
    evicted = [0]   # the cache model's evictions already reported

    def on_prefill(rec) -> None:
        # The cache model counts evictions as a whole; a record carries those since the last one.
        if model.prefix_cache is not None:
            rec.evicted_pages, evicted[0] = model.prefix_cache.evictions - evicted[0], model.prefix_cache.evictions
        metrics.observe_prefill(rec, grid is not None)

    model = EngineModel(profile, args.role, sched, grid, batch_prefill_graphs_mode=args.batch_prefill_graphs_mode,
                        max_running=max_running, kv_pages=args.kv_pages, context_len=context,
                        on_prefill=on_prefill, on_warm=metrics.observe_warm, decode_order=config.decode_order)
    if args.prefix_cache and args.role != "decode":   # decode engines keep no cache (as the builtin)
        model.prefix_cache = PrefixCacheModel(model.num_pages * model.page_size, model.page_size)
    calibrate(model)
    engine = EmulatedEngine(model, tokenizer, config, on_first_token=metrics.observe_first_token)
    settings = server_settings(args, name, max_running, backend="emulated", profile=profile.name)
    log.info("emulated engine: profile %s (%s), %d KV pages x %d tokens, max %d running", profile.name,
             profile.provenance, model.num_pages, model.page_size, max_running)
    return EngineServer(engine, settings, metrics, codec=EmulatedKVCodec(profile)), engine
