"""OpenTelemetry input: OTLP/HTTP spans (``receiver``) and OTLP JSON files (``files``) become v1 trace
events by the GenAI semantic conventions (``mapping``, pure). docs/integrations/otlp.md."""
