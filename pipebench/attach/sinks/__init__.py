"""The recorder's sinks (pipebench.attach.sinks.sink_set), one module a library."""
