"""The optional Kafka side of acceptance: an ingress that accepts extraction requests from a topic
(``ingress.py``) and an export of job events to a topic (``export.py``). Both need the ``kafka``
extra; the rest of the service never imports them."""
