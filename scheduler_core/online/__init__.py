"""Online services: their load, their latency and how much of it offline work may take.

``load`` simulates and scales a service's load; ``forecast`` predicts the next interval's peak;
``split`` recovers a replica's share of a shared GPU from its request rate; ``latency_model`` a
service's latency against its load; ``latency_budget`` each replica's slowdown allowance from
its service's budget; ``dynamic_sm`` the offline job's MPS share that complements the forecast.
"""
