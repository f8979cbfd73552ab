"""Reading traces: the trace format and its core schema (format), the predictor arrays policies read and the APEX
CDF's δ̂ / δ* (predictor_arrays), routing statistics (stats: `chipsim inspect`). No torch: producing traces is
chipsim.tracegen."""
