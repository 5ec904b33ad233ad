"""The run machinery behind ``DurableChat`` and our flows: private, never imported from
outside ``prefect_coder`` (a test keeps it so).

It holds a workflow for a flow run (begun, kept alive, ended), names and marks the run
in Prefect, publishes what a person reads, and resolves blocks to the process's shared
client and store. The public names are in ``prefect_coder``, ``prefect_coder.settings``,
``prefect_coder.tasks``, ``prefect_coder.flows``, ``prefect_coder.blocks`` and
``prefect_coder.operations``.
"""
