"""The live dashboard: a page served by the control plane and the JSON API it reads.

``summary`` (pure) turns the services' ``/metrics`` texts into totals and chart points;
``collector`` scrapes them on a timer; ``api`` serves ``/dashboard/`` and ``/api/v1/overview``
(docs/api.md).
"""
