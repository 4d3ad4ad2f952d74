// Package poolmetrics is the Prometheus collector of pkg/pool's figures:
// loopvol_pool_size_bytes, loopvol_pool_available_bytes,
// loopvol_pool_cow_reserve_bytes, loopvol_pool_orphan_images,
// loopvol_pool_orphan_bytes and loopvol_pool_usable, each labelled
// with the pool and its zone, measured at every scrape (Measure). It stands
// beside pkg/pool, which imports only the standard library and x/sys, so
// that the pools themselves never depend on Prometheus.
package poolmetrics
