// RUN: stageml-opt %s -p bt-improve | filecheck %s

// A product whose output columns are scaled by an earlier-stage vector, as an
// int8 weight-only layer computes (compiler/quantized.py), with a LoRA branch
// beside it, on bt-propagate's output:
//   %6 = (x @ dequant(Q)) * v + 2 * ((x @ A^T) @ B^T)
// is one linear form: x @ (dequant(Q) * v + 2 * A^T B^T), the scaled weight
// static, the merge adapter-time, one request-time product.

// CHECK-LABEL: func.func @main
// CHECK:      %[[T:[0-9]+]] = torch.aten.permute %arg0, %{{[0-9]+}} {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[W:[0-9]+]] = torch.aten.to.dtype %[[T]], %int6, %false, %false, %none {bt.time = #bt.time<"static">}
// CHECK:      %[[AT:[0-9]+]] = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[BT:[0-9]+]] = torch.aten.transpose.int %arg3, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[WV:[0-9]+]] = torch.aten.mul.Tensor %[[W]], %arg1 {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[16],f32> -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[AB:[0-9]+]] = torch.aten.mm %[[AT]], %[[BT]] {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[S:[0-9]+]] = torch.aten.mul.Scalar %[[AB]], %float2.000000e00 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[M:[0-9]+]] = torch.aten.add.Tensor %[[WV]], %[[S]], %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[Y:[0-9]+]] = torch.aten.matmul %arg4, %[[M]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
// CHECK-NEXT: return %[[Y]] :
func.func @main(%arg0: !torch.vtensor<[16,8],si8> {bt.name = "fc.base_layer.weight.qdata", bt.time = #bt.time<"static">},
                %arg1: !torch.vtensor<[16],f32> {bt.name = "fc.base_layer.weight.scale", bt.time = #bt.time<"static">},
                %arg2: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">},
                %arg3: !torch.vtensor<[16,2],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">},
                %arg4: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,16],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
  %false = torch.constant.bool false {bt.time = #bt.time<"static">}
  %none = torch.constant.none {bt.time = #bt.time<"static">}
  %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
  %0 = torch.prim.ListConstruct %int1, %int0 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int) -> !torch.list<int>
  %1 = torch.aten.permute %arg0, %0 {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],si8>, !torch.list<int> -> !torch.vtensor<[8,16],si8>
  %2 = torch.aten.to.dtype %1, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],f32>
  %3 = torch.aten.matmul %arg4, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %4 = torch.aten.mul.Tensor %3, %arg1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16],f32> -> !torch.vtensor<[?,16],f32>
  %5 = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[2,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,2],f32>
  %6 = torch.aten.matmul %arg4, %5 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,2],f32> -> !torch.vtensor<[?,2],f32>
  %7 = torch.aten.transpose.int %arg3, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,16],f32>
  %8 = torch.aten.matmul %6, %7 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[?,16],f32>
  %9 = torch.aten.mul.Scalar %8, %float2.000000e00 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.float -> !torch.vtensor<[?,16],f32>
  %10 = torch.aten.add.Tensor %4, %9, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,16],f32>
  return %10 : !torch.vtensor<[?,16],f32>
}
