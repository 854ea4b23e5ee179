// RUN: stageml-opt %s -p attach-hopper-target | filecheck %s

// The module carries StageML's Hopper target (hopper.mlir): IREE 3.13 has
// no sm_90 target of its own. Nothing else changes.

// CHECK: #[[SM90:.+]] = #hal.executable.target<"cuda", "cuda-nvptx-fb", {iree_codegen.target_info = #iree_gpu.target<arch = "sm_90", features = "+ptx80", {{.*}}subgroup_size_choices = [32]{{.*}}max_workgroup_memory_bytes = 232448{{.*}}chip = <wgp_count = 132>>}>
// CHECK: #[[DEVICE:.+]] = #hal.device.target<"cuda", [#[[SM90]]]> : !hal.device
// CHECK: module attributes {hal.device.targets = [#[[DEVICE]]]}
// CHECK-NOT: hal.executable.source
// CHECK-LABEL: func.func @f(%arg0: tensor<4x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT:    return %arg0
module {
  func.func @f(%x: tensor<4x8xf16>) -> tensor<4x8xf16> {
    return %x : tensor<4x8xf16>
  }
}
