"""remove-endpoint: endpoints that keep failing taken out of their URL Groups, and put back.

    decide (pipeline/decide.py, failures.py): a dlqId of a remove-endpoint rule is one
        failure of its (URL Group, endpoint), counted by the store as its decision settles
    remover.Remover: a threshold reached -> read the group, judge (verdict.py), record
        the intent, DELETE, settle; a crash in between is resolved by reading again
    restore.py: `recoveryd removals`, `recoveryd restore-endpoint` and their admin routes
        (api.py), from the record of each removal

The states of a removal are in `daemon/store/removals.py`.
"""
