"""``tracekit mcp``: tracekit's answers for agents over the Model Context Protocol (stdio).
Tools as plain functions (:mod:`.tools`), path and SQL checks (:mod:`.sandbox`), worker, server."""
