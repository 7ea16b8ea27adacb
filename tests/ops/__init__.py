"""Operations: readiness, metrics, structured logs."""
