// RUN: stageml-opt %s -p bt-annotate,bt-propagate,lora-sites,bt-lift,bt-gather,bt-verify --stage 'fc.base_layer.weight=static' | filecheck %s
// RUN: stageml-opt %s -p bt-annotate,bt-propagate,lora-sites,bt-lift,bt-gather,bt-split --stage 'fc.base_layer.weight=static' | filecheck %s --check-prefix=SPLIT

// Per-row tenants: the adapter-time factors reach the request stage through
// bt.gather by the new last input adapter_ids, and each product with them
// becomes a per-row (batched) product; a 2-D input is unsqueezed to rows of 1.

// CHECK-LABEL: func.func @main
// CHECK-SAME:    %arg4: !torch.vtensor<[?],si64> {bt.name = "adapter_ids", bt.time = #bt.time<"dynamic">}
// CHECK-NOT:     "bt.lift"(%{{[0-9]+}}) {{.*}}from = #bt.time<"adapter">
// CHECK:         %[[GA:[0-9]+]] = "bt.gather"(%{{[0-9]+}}, %arg4) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,16],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,64,16],f32>
// CHECK:         %[[X3:[0-9]+]] = torch.aten.unsqueeze %arg3, {{.*}} -> !torch.vtensor<[?,1,64],f32>
// CHECK-NEXT:    %[[T3:[0-9]+]] = torch.aten.matmul %[[X3]], %[[GA]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,64],f32>, !torch.vtensor<[?,64,16],f32> -> !torch.vtensor<[?,1,16],f32>
// CHECK-NEXT:    %{{.*}} = torch.constant.int 1
// CHECK-NEXT:    %{{[0-9]+}} = torch.aten.squeeze.dim %[[T3]], {{.*}} -> !torch.vtensor<[?,16],f32>
// CHECK:         "bt.gather"({{.*}}name = "adapter.1"{{.*}} -> !torch.vtensor<[?,16,48],f32>

// @adapter returns the factors; @forward takes them as tables (bt.table),
// which it indexes by adapter_ids.
// SPLIT-LABEL: func.func @adapter
// SPLIT-SAME:    -> (!torch.vtensor<[64,16],f32> {bt.name = "adapter.0"}, !torch.vtensor<[16,48],f32> {bt.name = "adapter.1"})
// SPLIT-LABEL: func.func @forward
// SPLIT-SAME:    %arg1: !torch.vtensor<[?,64,16],f32> {bt.name = "adapter.0", bt.table, bt.time = #bt.time<"adapter">}
// SPLIT-SAME:    %arg2: !torch.vtensor<[?,16,48],f32> {bt.name = "adapter.1", bt.table, bt.time = #bt.time<"adapter">}
// SPLIT-SAME:    %arg4: !torch.vtensor<[?],si64> {bt.name = "adapter_ids", bt.time = #bt.time<"dynamic">}
// SPLIT:         torch.aten.index_select %arg1, %{{.*}}, %arg4
// SPLIT:         torch.aten.index_select %arg2, %{{.*}}, %arg4
// SPLIT-NOT:     bt.gather
func.func @main(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight"}, %arg1: !torch.vtensor<[4,64],f32> {bt.name = "fc.lora_A.default.weight"}, %arg2: !torch.vtensor<[48,4],f32> {bt.name = "fc.lora_B.default.weight"}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x"}) -> !torch.vtensor<[?,48],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %float2 = torch.constant.float 2.000000e+00
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
  %1 = torch.aten.matmul %arg3, %0 : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,4],f32>
  %3 = torch.aten.matmul %arg3, %2 : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 : !torch.vtensor<[48,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,48],f32>
  %5 = torch.aten.matmul %3, %4 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,48],f32> -> !torch.vtensor<[?,48],f32>
  %6 = torch.aten.mul.Scalar %5, %float2 : !torch.vtensor<[?,48],f32>, !torch.float -> !torch.vtensor<[?,48],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
  return %7 : !torch.vtensor<[?,48],f32>
}
