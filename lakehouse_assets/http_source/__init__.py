"""``lakehouse serve``: an HTTP endpoint that lands the events producers POST as landing files,
acknowledged once durable, so everything after the landing zone is unchanged."""
