"""Not a language model: batched image classification with a ResNet-50 (torchvision, random
weights), 24 batches of 32 images after 2 warm-up batches; each batch's top-1 classes are
copied to the host (an argmax and a small device-to-host copy per batch, like a decode step's,
yet no tokens)."""
import torch
import torchvision

from clock import Clock, device_and_dtype
from common import dry

dev, dtype = device_and_dtype()
torch.manual_seed(0)
net = torchvision.models.resnet50(weights=None).to(dev, dtype).eval().to(memory_format=torch.channels_last)
clock = Clock("g16_vision")
clock.watch(net, "resnet50")
labels = []
with torch.inference_mode():
    for b in range(dry(26, 3)):
        x = torch.randn(dry(32, 2), 3, 224, 224, device=dev, dtype=dtype).to(memory_format=torch.channels_last)
        with clock.request(images=x.shape[0], warmup=b < 2):
            labels.append(net(x).argmax(dim=-1).tolist())
clock.report(kind="not a generation: image batches", batches=len(labels))
