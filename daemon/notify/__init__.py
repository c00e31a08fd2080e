"""The notify action: a JSON summary of a dead letter POSTed to a rule's webhook.

    decide (pipeline/decide.py) -> summary.notices: what each notify rule will post
    store.settle                 -> queued in the same commit as the decision (an outbox)
    notifier.Notifier            -> posts what is due, retried with backoff (delivery.py)

A notification is a side effect of the decision with its own state (pending, sent,
failed) in the store, so a crash neither loses one nor posts one again after its
receiver answered 2xx; a repeat after a lost answer carries the same Idempotency-Key.
"""
