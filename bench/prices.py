"""Spot prices for the GPU benchmark's cost table, each with its source and the date it was read.

Google's pricing pages cannot be reached from the machines that build this project; the figures come from
SkyPilot's Google Cloud catalog, a daily export of the Cloud Billing Catalog API's Compute Engine SKUs, at one
commit (``SOURCE``). A machine there is priced as its host row plus its accelerator row (a ``g2-standard-8`` row
has no GPU in it). These are Compute Engine spot prices, so the price of a GKE Standard node of the stack's own
machine type (``infra/config.py``'s GPU machines). Autopilot Spot Pods are billed by their requests at
Autopilot's own rates, which the catalog does not hold: the table says so rather than guess them.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = ("https://github.com/skypilot-org/skypilot-catalog/blob/6f65ab58724c0a5b17dbb81ee124e7d7dee0d4a5/"
          "catalogs/v7/gcp/vms.csv")
READ_ON = "2026-11-28"
REGION = "us-central1"  # zones a, b and c list the same prices


@dataclass(frozen=True)
class Price:
    per_hour: float  # USD, spot, REGION
    parts: str  # the catalog's rows it adds up, as written there


# One L4 on the stack's Standard-mode machine for it (infra/config.py: nvidia-l4 x1 -> g2-standard-8).
L4_POD = Price(0.11747 + 0.2231, "g2-standard-8 host 0.11747 + one L4 0.2231")
# One vCPU with 4 GiB: half an e2-standard-2 (the general-purpose machine; n2d-standard-2 is 0.01753 for two).
CPU_VCPU = Price(0.02679 / 2, "half an e2-standard-2 (2 vCPUs, 8 GiB) at 0.02679")
# The catalog has no H200 GPU row (only a3-ultragpu-8g's host): the GPU measured so far stays unpriced.


def dollars(price: Price, seconds: float) -> float:
    """What ``seconds`` of the pool cost."""
    return price.per_hour * seconds / 3600


def cited() -> str:
    return (f"Prices: Compute Engine spot prices in {REGION}, read {READ_ON} from {SOURCE} (SkyPilot's daily export "
            "of the Cloud Billing Catalog API). A pool is priced as its machine's host row plus its GPU row, so as "
            "a GKE Standard node; Autopilot Spot Pods are billed at Autopilot's own per-request rates, not in that "
            "catalog. Spot prices change: the date is the date they were read.")
